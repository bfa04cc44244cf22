"""`draftgate bench`: the engine against HF transformers (and llama.cpp), side by side in one run."""
