"""The main job on the embedded default corpus (`make demo`).

For now: the pretraining smoke run (tools/pretrain_smoke.py) on IMDB text.
"""

from tools import pretrain_smoke

if __name__ == "__main__":
    pretrain_smoke.run()
