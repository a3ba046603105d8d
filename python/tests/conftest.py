"""Shared set-up of the pytest suite: the reference scripts' folder on the path (the torch
reference for Muon's f32 iteration), and torch's NumPy warning silenced (nothing here needs
NumPy)."""
import pathlib
import sys
import warnings

warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches" / "reference"))
