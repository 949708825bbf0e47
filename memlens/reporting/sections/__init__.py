"""The report's sections: the section type and context (`base`), then one module per group of sections.

Modules: `access`, `base`, `memory`, `runs`, `whatif`."""
