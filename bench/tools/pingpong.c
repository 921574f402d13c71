/* Cross-core round trip between CPUs 0 and 1 (one cache line bounced 200000 times).
 * Build and run: gcc -O2 -pthread bench/tools/pingpong.c -o /tmp/pingpong && /tmp/pingpong
 * On this project's 2-vCPU VM it reads ~395 ns in the state where 2-thread runs of
 * sync-heavy models (squeezenet, resnet18) are slower than 1-thread ones; see
 * bench/NOTES.md section 18. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <time.h>
#include <sched.h>
static _Atomic int flag __attribute__((aligned(64)));
#define N 200000
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void* other(void*a){pin(1);for(int i=0;i<N;i++){while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+1);atomic_store_explicit(&flag,2*i+2,memory_order_release);}return 0;}
int main(){pthread_t t;pthread_create(&t,0,other,0);pin(0);struct timespec a,b;clock_gettime(CLOCK_MONOTONIC,&a);
for(int i=0;i<N;i++){atomic_store_explicit(&flag,2*i+1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=2*i+2);}
clock_gettime(CLOCK_MONOTONIC,&b);pthread_join(t,0);printf("round trip %.1f ns\n",((b.tv_sec-a.tv_sec)*1e9+(b.tv_nsec-a.tv_nsec))/N);}
