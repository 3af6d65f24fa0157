"""The kubelet device plugin API (v1beta1): the .proto files and the stubs generated from them.

`make protos` regenerates the stubs (`generate.py`); the stub modules are never edited by hand.
"""
