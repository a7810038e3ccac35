"""Code that runs inside each torchrun worker. Never imports Textual."""
