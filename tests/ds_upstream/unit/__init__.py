# Copyright (c) Microsoft Corporation.
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
# Pinned copy of deepspeedai/DeepSpeed tests/unit/__init__.py at edaa7221267243c7be7fb49c5d5f5c4fb97b4641.
'''Copyright The Microsoft DeepSpeed Team'''
