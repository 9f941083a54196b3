"""Privacy of a site's update: secure aggregation (pairwise masks, Shamir shares for dropouts) and
differential privacy (clipping, Gaussian noise, an RDP accountant). Pure modules, no I/O."""
