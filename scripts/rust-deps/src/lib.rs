//! Empty: this crate exists so cargo builds its dependencies' rlibs.
