"""Pure figure functions: data in, plotly Figure out (no streamlit), one module per page."""
