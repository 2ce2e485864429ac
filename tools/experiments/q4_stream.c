// tools/experiments/q4_stream.c: the exact decode route's arithmetic per Q4_0
// block (zero-extend 16 code bytes, split nibbles, two converts, scale, two
// FMAs) streamed over 600 MB of rows of K = 2048, on anonymous memory with
// 4 KiB pages and with MADV_HUGEPAGE, without and with a prefetch 4 KiB ahead.
// The table "Weights on huge pages" in docs/reference/performance.md.
//
//   gcc -O2 -mavx512f tools/experiments/q4_stream.c -o /tmp/q4_stream && /tmp/q4_stream
//
// Not part of the build: an experiment that separated the causes of the
// decode stall (page size, misses in flight) before the engine changed.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
float x[8192] __attribute__((aligned(64)));
static float dotrow(const unsigned char*p,int K,int pf){__m512 a0=_mm512_setzero_ps(),a1=a0;__m512i m=_mm512_set1_epi32(15);
 for(int b=0;b<K/32;b++,p+=18){ if(pf)_mm_prefetch((const char*)p+pf,_MM_HINT_T1); __m512 s=_mm512_set1_ps(1.0f+p[0]*1e-3f);
  __m512i q=_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(p+2)));
  a0=_mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q,m)),s),_mm512_load_ps(x+b*32),a0);
  a1=_mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q,4)),s),_mm512_load_ps(x+b*32+16),a1);}
 return _mm512_reduce_add_ps(_mm512_add_ps(a0,a1));}
static double run(const unsigned char*a,size_t n,int pf){int K=2048,rb=K/32*18; size_t rows=n/rb; volatile float s=0; double best=1e9;
 for(int r=0;r<3;r++){double t=now(); for(size_t i=0;i<rows;i++)s+=dotrow(a+i*rb,K,pf); t=now()-t; if(t<best)best=t;} return rows*rb/best/1e9;}
int main(){size_t n=(size_t)600<<20; for(int i=0;i<8192;i++)x[i]=i*1e-4f;
 unsigned char*a=aligned_alloc(4096,n); memset(a,3,n);
 char*h=mmap(0,n+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0); unsigned char*hh=(unsigned char*)(((size_t)h+(2<<20)-1)&~((size_t)(2<<20)-1)); madvise(hh,n,MADV_HUGEPAGE); memset(hh,3,n);
 FILE*f=fopen("/proc/self/smaps_rollup","r"); char line[256]; while(fgets(line,256,f)) if(strstr(line,"AnonHuge")) fputs(line,stdout);
 for(int pf=0;pf<=4096;pf+=4096) printf("pf=%d: 4K %.2f GB/s, THP %.2f GB/s\n",pf,run(a,n,pf),run(hh,n,pf));}
