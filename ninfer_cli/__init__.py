"""The `ninfer` command line."""
