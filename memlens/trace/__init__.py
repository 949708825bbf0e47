"""The data model: the `Trace` (its tables and metadata), the schema its tables follow, the checks a trace
passes, and the ``NAME.memlens/`` directory a trace is saved to and read from.

Modules: `model` (the Trace class, event order, clock), `schema` (tables, columns, dtypes, categories),
`checks` (metadata and value ranges), `tracedir` (the saved directory and writing it), `read` (loading it
back), `partitioned` (writing a big trace row group by row group). Recorders and importers (`memlens.recording`,
`memlens.io`) produce Traces and import this package; it imports neither.
"""
from memlens.trace.model import Trace, clock_of, event_order, live_events
from memlens.trace.schema import (CATEGORIES, OPTIONAL_COLUMNS, OPTIONAL_TABLES, REQUIRED_TABLES, SCHEMA,
                                  SCHEMA_VERSION, conform, conform_clock, empty_table)

__all__ = ["Trace", "clock_of", "event_order", "live_events", "CATEGORIES", "OPTIONAL_COLUMNS",
           "OPTIONAL_TABLES", "REQUIRED_TABLES", "SCHEMA", "SCHEMA_VERSION", "conform", "conform_clock",
           "empty_table"]
