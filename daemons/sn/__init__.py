"""The SN node: hosts the ledger and serves it over the bus."""
