"""draftgate's decoding engine: a lean decoder, drafters, an exact verifier and the generate loop."""
