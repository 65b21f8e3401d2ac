//! Example variants shared by the tutorial programs.
