import sys
from pathlib import Path

# Make the independent references in tests/ importable as `reference`, and the engine
# reproductions in tests/sglang/ as `sglang_main_reproduction`.
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "sglang"))
