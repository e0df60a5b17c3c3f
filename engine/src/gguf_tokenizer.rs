//! Placeholder: owned by a helper.
