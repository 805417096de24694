"""Scripts copied into sandboxes and run there by a plain `python3 -I -S` (stdlib only)."""
