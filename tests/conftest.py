import sys
from pathlib import Path

# Make the independent references in tests/ importable as `reference`.
sys.path.insert(0, str(Path(__file__).parent))
