"""The attacks: each takes what an eavesdropper or the server holds (an observation: the update, the model the
client received, the recipe read from the capture) and returns what it recovers; ground truth never enters."""
