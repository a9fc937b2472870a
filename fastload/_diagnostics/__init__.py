"""Diagnostics: the loaders' statistics, `fastload iostat`, and what it reads of the machine."""
