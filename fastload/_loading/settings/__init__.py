"""Settings: what a FastLoader was asked for, checked once — argument checks, `LoaderSpec`, the
"runs but would train wrong" checks, and what a state_dict records and how it is verified.

May import foundations, `sources`, `transforms` and the rooms below it (`decoding`, `slots`,
`order`, `jobs`, `link`); not `running`, which takes a checked spec.
"""
