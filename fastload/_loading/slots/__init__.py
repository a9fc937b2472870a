"""Slots: the batch ring in shared memory (`ring`, sized and pre-flighted by `ring_plan`, grown
and shrunk while it lives only by `ring_resize`), where each leaf of a batch lives in a slot
(`layout`), and how a ready slot becomes the user's batch (`delivery`, `identity`: sample ids).

May import foundations, `transforms`, `_augment` and `_loading.decoding`; no other room of
`_loading` (every other room writes into or reads from slots).
"""
