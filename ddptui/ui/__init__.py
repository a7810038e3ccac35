"""The Textual UI: the app, the Source protocol it drives, the view model (no Textual) and the widgets."""
