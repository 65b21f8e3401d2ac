//! Parsing with syn. (Owned by the front-end work.)
