import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # test modules share fixtures (e.g. test_report.training_trace)
