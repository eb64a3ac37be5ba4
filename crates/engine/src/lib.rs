//! Generic decoder (in progress).
