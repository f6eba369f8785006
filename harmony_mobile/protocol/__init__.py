"""What crosses the wire between phones, training clients and servers: the bottom layer.

`messages` (the typed messages of training and deployment), `wire` (the HMFT tensor and HMUP
upload binary formats), `label_tokens` (label epochs, class tokens, slot-table parsing), `slots`
(the slot table a server keeps per epoch), `sealing` (uploads encrypted to the server's key),
`public_keys` (the signing keys an export ships and a phone pins) and `digests` (file sha256 as
manifests state it). These import nothing of harmony_mobile but each other.
"""
