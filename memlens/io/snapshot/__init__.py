"""Reading CUDA memory snapshots (every era): the importer, the streaming walkers, the pairing of events, the
story of categories and phases.

Modules: `convert`, `events`, `frames`, `importer`, `limits`, `meta`, `odd_frames`, `optimizer`, `pairing`,
`phases`, `segments`, `stacks`, `story`, `stream`."""
