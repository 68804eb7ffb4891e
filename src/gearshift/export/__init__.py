"""Gears in the start-up forms of engines that capture their graphs once (`gearshift export`
writes them, `gearshift serve --initial-gears` reads them back): export formats, no part of the
controller's loop. Pure: text in, text out (`engines`; `engine_text` reads an engine's own
settings)."""
