"""The work as plain functions (merge engine, later training and evaluation), then thin Ray wrappers."""
