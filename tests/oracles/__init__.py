"""Reference implementations the tests hold specgen to: written from z-lab's and DeepSpec's
code and papers, never imported by the package."""
