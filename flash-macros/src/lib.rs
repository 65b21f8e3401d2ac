//! The `attention!` macro. (Owned by the front-end work.)
