"""The loader: what runs a FastLoader's epochs, in this process and its workers."""
