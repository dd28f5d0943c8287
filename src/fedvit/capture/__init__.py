"""Recording only: what a Flower app's clients received and sent, in the one capture layout the audit reads.

``capture_mod`` (a ClientApp mod), ``CapturingStrategy`` (wraps any Message-API strategy), the wire tap's
message rebuilding and the capture reader. Nothing here imports the attacks, the audit or torch (an import
contract in pyproject.toml keeps it so).
"""

from fedvit.capture.writer import CapturingStrategy, capture_mod

__all__ = ["CapturingStrategy", "capture_mod"]
