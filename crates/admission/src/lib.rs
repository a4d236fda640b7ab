//! Pure admission: defaulting, validation and IP/port allocation for API objects.
