"""Diagnostics: `fastload iostat` (from the loaders' statistics blocks), `fastload probe`, and
what they read of the machine (/proc, /sys)."""
