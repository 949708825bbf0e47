"""Reading Kineto / Chrome traces: the importer, the op table, kernels and clocks, cost facts, transfers,
collectives, the streamed reader.

Modules: `attrib`, `comms`, `facts`, `importer`, `kernels`, `legacy`, `ops`, `stream`, `transfer`."""
