"""Settings: what a FastLoader was asked for, checked once — argument checks (`arguments`), the
arguments resolved into a `LoaderSpec` (`build`, `spec`), the "runs but would train wrong" checks
(`sanity`), the loader's position and the state_dict it saves and restores (`position`), and how
a saved state is verified and converted (`resume`).

May import foundations, `sources`, `transforms` and the rooms below it (`decoding`, `slots`,
`order`, `jobs`, `link`); not `running`, which takes a checked spec.
"""
