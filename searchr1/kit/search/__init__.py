"""The search reliability layer shared by every search provider plugin."""
