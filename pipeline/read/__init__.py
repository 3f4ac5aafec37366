"""read: the only code that touches JSON bytes. A trace file becomes a stream (`stream`), its
document is found (`document`), the events array is cut into chunks (`source`, `chunks`), and each
chunk is decoded into typed Arrow tables (`decode`), in worker processes for a large trace
(`workers`); hostile values are tamed (`tame`) and hostile inputs limited (`limits`)."""
