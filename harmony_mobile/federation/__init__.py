"""The round loop and the messages that cross the client/server boundary."""
