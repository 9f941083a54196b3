"""SL, the learning node: joins sync rounds, publishes and merges weights."""
