/*
 * SPDX-FileCopyrightText: Copyright (c) 1993-2024 NVIDIA CORPORATION &
 * AFFILIATES. All rights reserved. SPDX-License-Identifier: Apache-2.0
 *
 * Licensed under the Apache License, Version 2.0 (the "License");
 * you may not use this file except in compliance with the License.
 * You may obtain a copy of the License at
 *
 * http://www.apache.org/licenses/LICENSE-2.0
 *
 * Unless required by applicable law or agreed to in writing, software
 * distributed under the License is distributed on an "AS IS" BASIS,
 * WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
 * See the License for the specific language governing permissions and
 * limitations under the License.
 */
#pragma once


#include <flashinfer/trtllm/fmha/kernelParams.h>

namespace tensorrt_llm
{

namespace kernels
{
// clang-format off


struct TllmGenFmhaKernelMetaInfo
{
    Data_type mDataTypeQ;
    Data_type mDataTypeKv;
    Data_type mDataTypeK;
    Data_type mDataTypeV;
    Data_type mDataTypeO;
    int mTileSizeQ;
    int mTileSizeKv;
    int mStepQ;
    int mStepKv;
    int mHeadDimPerCtaV;
    int mHeadDimQk;
    int mHeadDimV;
    int mSM;
    const unsigned char* mCubin;
    unsigned int mCubinSize;
    const char* mFuncName;
    int mSharedMemBytes;
    int mThreadsPerCTA;
    int mQkvLayout;
    int mNumTokensPerPage;
    int mMaskType;
    int mKernelType;
    int mTileScheduler;
    int mMultiCtasKvMode;
    int mNumEltsPerSageAttnBlkQ;
    int mNumEltsPerSageAttnBlkK;
    int mNumEltsPerSageAttnBlkP;
    int mNumEltsPerSageAttnBlkV;
    bool mGroupsHeadsQ;
    bool mGroupsTokensHeadsQ;
    bool mReuseSmemKForV;
    bool m2CtaMma;
    int mSparseAttn;
    bool mSkipsSoftmaxWhenPossible;
    bool mReserved1;
    bool mReserved2;
    const char* sha256;
};

static const TllmGenFmhaKernelMetaInfo sTllmGenFmhaKernelMetaInfos[] = {
{ DATA_TYPE_E4M3, DATA_TYPE_E2M1, DATA_TYPE_E2M1, DATA_TYPE_E2M1, DATA_TYPE_E4M3, 128, 128, 256, 128, 64, 64, 64, kSM_100, nullptr, 0, "fmhaSm100aKernel_QE4m3KvE2m1OE4m3H64PagedKvDenseP32VarSeqQ128Kv128StaticContext", 64656, 512, 2, 32, 0, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "85ac21b9ad847f2cf75803d414f48fd59d0a0c960a8055016a9db6388d94338c"},
{ DATA_TYPE_FP16, DATA_TYPE_FP16, DATA_TYPE_FP16, DATA_TYPE_FP16, DATA_TYPE_FP16, 128, 128, 256, 128, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvFp16OFp16H128PagedKvCausalP16VarSeqQ128Kv128StaticContext", 164976, 512, 2, 16, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "fb10970f01bc9c18d0d1fca28159ec5da83808dfd2a1f5f4e2cfd61805317908"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalPagedVarSeqQ128Kv128StaticContext", 164976, 512, 2, 128, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "8312088beb100b13365e9f3709980950d64ffff308f9101d119c0d8db9ee1f99"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP16VarSeqQ128Kv128StaticContext", 164976, 512, 2, 16, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "0b8ed294e095197db442b37214ec3ccc9db44ea771cfea535aae5d1b10c1f012"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvSlidingOrChunkedCausalP16VarSeqQ128Kv128StaticContext", 164976, 512, 2, 16, 2, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "687e504dd8292bb55969a9fe80011fdb83f718ce01b3c67033da410dfbba0c00"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 192, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16HQk192HV128SeparateQkvDenseVarSeqQ128Kv128StaticContext", 196880, 512, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "66d1be545acddf9df1c1f32d29d808971bf854400432c02666c4b1e105a8efcc"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 192, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16HQk192HV128SeparateQkvCausalVarSeqQ128Kv128StaticContext", 196880, 512, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "37642b6e52875fea5b5531656a5c726f647326d635b3381169abff32d482aaae"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 192, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16HQk192HV128SeparateQkvCausalVarSeqSkipsSoftmaxQ128Kv128StaticContext", 196896, 512, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, true, false, false, "a00010c213d928c0bf271f6d2adec1f9cbc15630b9ed88c4d2c7b2a49c06bb7d"},
{ DATA_TYPE_E4M3, DATA_TYPE_E4M3, DATA_TYPE_E4M3, DATA_TYPE_E4M3, DATA_TYPE_BF16, 128, 128, 256, 128, 128, 192, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvE4m3OBfloat16HQk192HV128SeparateQkvCausalVarSeqQ128Kv128StaticContext", 114928, 512, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "1083b292f4e8bbc8e3b8b8e3ded3e895061bb27684e908b41bbc3dec92462e5b"},
{ DATA_TYPE_BF16, DATA_TYPE_E4M3, DATA_TYPE_E4M3, DATA_TYPE_E4M3, DATA_TYPE_BF16, 8, 128, 8, 128, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QBfloat16KvE4m3OBfloat16H128PagedKvDenseP16VarSeqQ8Kv128StaticSwapsAbForGen", 138720, 512, 2, 16, 1, 2, 0, 0, 0, 0, 0, 0, true, false, false, false, 0, false, false, false, "39456fd27af6aafe84b3a0f472bcf4aa413ba45777f1a07a16de1cf6b89a2613"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 64, 128, 64, 256, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalPagedVarSeqQ64Kv128StaticKeepsAbForGen", 148560, 512, 2, 128, 1, 3, 0, 0, 0, 0, 0, 0, true, true, false, false, 0, false, false, false, "00363aaab8747641529586d072842bdacebb51355196aa5d969512721203e7e5"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 64, 128, 64, 256, 128, 128, 128, kSM_100f, nullptr, 0, "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP16VarSeqQ64Kv128StaticKeepsAbForGen", 148560, 512, 2, 16, 1, 3, 0, 0, 0, 0, 0, 0, true, true, false, false, 0, false, false, false, "d4399fc6ebb24b4b6cf1e4769e51a45ba2d9466cfa69d539522e23d357aa5096"},
{ DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, DATA_TYPE_BF16, 128, 128, 128, 128, 256, 256, 256, kSM_103, nullptr, 0, "fmhaSm103aKernel_QkvBfloat16OBfloat16H256SeparateQkvCausalVarSeqQ128Kv128StaticContext", 196832, 384, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, false, false, false, false, 0, false, false, false, "12ec6e36805a3f05aa416ee0bf11138fa1cc2d471a9b413480327c2f324086e8"},
};

} // namespace kernels
} // namespace tensorrt_llm
