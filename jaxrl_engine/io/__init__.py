"""Configuration, run directories and metric logging."""
