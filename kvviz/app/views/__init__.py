"""One module per page whose drawing is long: what that page draws, with Streamlit; the computing stays below."""
