"""Getting the data out: exports, the items and changes API, fleet-wide feeds."""
