"""The loader: what runs a FastLoader's epochs, in this process and its workers.

Rooms by stage (each `__init__` says what it owns and may import): `decoding`, `slots`, `order`,
`jobs`, `link`, `settings`, `running`. At the top, above every room: `assembly.py` (a loader's
source, job, plan and pipelines, built from its checked spec), `loader.py` (`FastLoader`, the
facade over the assembly, the iterations and the position) and `folder_attributes.py` (its
torchvision ImageFolder attributes: `classes`, `class_to_idx`, `targets`).
"""
