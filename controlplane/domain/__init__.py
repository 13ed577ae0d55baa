"""The pure core: names, releases, checksums, slot states and operations.

Nothing here touches the disk, the network or a clock; everything is stdlib-only, so it can be
tested exhaustively and reused by every adapter and service.
"""
