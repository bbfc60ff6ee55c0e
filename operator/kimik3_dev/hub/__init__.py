"""A stand-in for the Hugging Face hub (``server.FakeHub``) and a tiny checkpoint to publish on it
(``checkpoint.write_checkpoint``): the model hub is the one part of staging that cannot run here."""
