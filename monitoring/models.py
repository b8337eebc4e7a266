"""GPU samples, rollups and alerts arrive with the monitoring work; see DESIGN.md."""
