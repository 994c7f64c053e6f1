//! Charts, generic over plotters' `DrawingBackend`: data in, pixels out.
