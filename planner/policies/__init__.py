"""Named decision policies behind one small interface."""
