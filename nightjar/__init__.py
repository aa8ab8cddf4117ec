"""The nightjar command line."""
