"""What crosses the wire between phones, training clients and servers: the bottom layer.

`messages` (the typed messages of training and deployment), `wire` (the HMFT tensor and HMUP
upload binary formats), `label_tokens` (label epochs, class tokens, slot decoding), `slots` (the slot table a server
keeps per epoch) and `sealing` (uploads encrypted to the server's key). These import nothing of harmony_mobile but each other.
"""
