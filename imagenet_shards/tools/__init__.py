"""Modules that each back one command, kept apart from the library they use:

    tar_shards   tar_tools.py (show, tsv, cat, split, sort, shuffle, reindex)
    upload       upload_dataset.py
    same_as      validate_dataset.py --same-as
    demo         `make demo` (python -m imagenet_shards.tools.demo)

imagenet_shards.ledger stays at the package root: `python -m imagenet_shards.ledger verify` is the command the
loader's docs and the training example name.
"""
