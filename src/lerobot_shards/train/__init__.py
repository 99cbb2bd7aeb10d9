"""``lerobot-shards train``: LeRobot's own trainer on shards (``run.py`` says how it is joined).

Imports LeRobot and accelerate (``pip install 'lerobot[training]'``); nothing else in the
package does, so ``import lerobot_shards.train`` is the one place that needs them.
"""
